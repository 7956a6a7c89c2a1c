"""The subcommands' CLI modules (floor 8): one module per command, named for it, each registering its
subparser and parsing and printing only; the work is in the library packages below. `gpucluster/cli.py`
is the entry point and imports only the module of the command given (`cli.subcommand_module`)."""
