import sys

from jaxrl_hier.skills.cli import main

sys.exit(main())
