import subprocess
import sys

from pyrodash.cli import COMMANDS, build_parser, main


def test_help_lists_every_existing_command(capsys):
    parser = build_parser()
    listed = set(parser._subparsers._group_actions[0].choices)  # the subcommands argparse knows
    assert "cost" in listed
    assert listed <= set(COMMANDS)
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in listed:
        assert name in out


def test_every_subcommand_has_help_and_no_placeholder():
    for name in build_parser()._subparsers._group_actions[0].choices:
        out = subprocess.run([sys.executable, "-m", "pyrodash.cli", name, "--help"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "not implemented" not in (out.stdout + out.stderr).lower()


def test_unknown_command_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "pyrodash.cli", "nope"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "invalid choice" in out.stderr


def test_only_the_command_run_is_imported():
    """Command modules import what they need at their top; the CLI imports just the one being run, so `pyrodash cost`
    (or `pyrodash --help`) never pays for TRL or torch."""
    code = (
        "import sys\nfrom pyrodash.cli import main\nmain(['cost', '--json'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('pyrodash.commands.')), 'trl' in sys.modules, "
        "'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['pyrodash.commands.cost'] False False"
