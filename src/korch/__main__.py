import sys

from korch.cli import main

sys.exit(main())
