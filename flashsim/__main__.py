"""`python -m flashsim ...`: the same as the `flashsim` console script."""

import sys

from flashsim.main import main

sys.exit(main())
