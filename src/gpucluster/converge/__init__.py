"""Converging a fleet by pull: the compiled state packed once into a checksummed bundle (bundle), and the
fan-out that has every node fetch it from the controller and run the same roles locally (pull).
docs/roles.md, "Converging a fleet"."""
