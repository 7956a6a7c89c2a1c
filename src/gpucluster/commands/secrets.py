"""`gpucluster secrets --generate / --pulumi-stack STACK`: argument parsing and printing only (the work is in
gpucluster.configure.secrets and gpucluster.deploy.stackoutputs)."""

from __future__ import annotations

import argparse

from gpucluster.commands._flags import print_json, report_flags


def cmd_secrets(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpucluster.errors import UsageError

    if args.generate:
        from gpucluster.configure.secrets import generate, write_secrets_file

        if not args.output:
            raise UsageError("--generate needs -o FILE (outside the checkout, e.g. ~/.config/gpucluster/prod.json)")
        path = Path(args.output).expanduser()
        if path.exists() and not args.force:
            raise UsageError(f"{path} exists: a new munge key locks every node out until configure installs it; "
                             "pass --force to replace it")
        written = write_secrets_file(generate(), path)
    else:
        from gpucluster.deploy.stackoutputs import secrets_from_stack

        written = secrets_from_stack(args.pulumi_stack, Path(args.output) if args.output else None)
    if args.json:
        print_json({"written": str(written), "mode": "0600"})  # the path only: the secrets stay in the file
        return 0
    print(f"wrote {written} (mode 0600): gpucluster configure INVENTORY --secrets {written} "
          f"(or ansible-playbook -e @{written}); keep it out of git")
    return 0


def register(sub) -> None:
    q = sub.add_parser("secrets", help="write the cluster's secrets (munge key, slurmdbd password, bundle-signing "
                                       "key) to a 0600 "
                                       "extra-vars file outside the checkout, for configure --secrets",
                       description="Write the cluster's secrets, a munge key, the slurmdbd password and the "
                                   "bundle-signing key, to a 0600 "
                                   "file in a private folder outside the checkout: generated here, or taken from a "
                                   "Pulumi stack that generated them. configure --secrets reads it.",
                       epilog="examples:\n  gpucluster secrets --generate -o ~/.config/gpucluster/prod.json\n"
                              "  gpucluster secrets --pulumi-stack meta-24k-roce\n",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--generate", action="store_true", help="generate a new munge key, slurmdbd password and "
                     "bundle-signing key")
    how.add_argument("--pulumi-stack", metavar="STACK", help="read the secrets a `pulumi up` of this stack generated")
    q.add_argument("-o", "--output", metavar="FILE", help="file to write (required with --generate; default for a "
                   "stack: $XDG_RUNTIME_DIR/gpucluster/secrets/STACK.json, else "
                   "~/.config/gpucluster/secrets/STACK.json)")
    q.add_argument("--force", action="store_true", help="with --generate: replace an existing file")
    report_flags(q, "where the secrets were written, as JSON: written, mode (never the secrets themselves)")
    q.set_defaults(func=cmd_secrets)
