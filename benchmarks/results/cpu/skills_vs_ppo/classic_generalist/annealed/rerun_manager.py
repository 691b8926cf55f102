"""A copy of a finished run that keeps its skills and generalist and drops its manager stage (with
`--generalist`, its generalist stage too), with the given `manager` settings in the copy's
`config.yaml`; `skills resume OUT` then trains the dropped stages again. The results pages cite it;
it is now `python -m jaxrl_hier.skills branch` (skills.branch), which this calls:

    python rerun_manager.py [--generalist] SRC OUT [key=value ...]
    = python -m jaxrl_hier.skills branch SRC OUT [--keep-generalist unless --generalist] [manager.key=value ...]
"""
import sys

from jaxrl_hier.skills.cli import main

args = [a for a in sys.argv[1:] if a != "--generalist"]
keep_generalist = len(args) == len(sys.argv) - 1
sys.exit(main(["branch", *args[:2], *(["--keep-generalist"] if keep_generalist else []),
               *(f"manager.{item}" for item in args[2:])]))
