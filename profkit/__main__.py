import sys

from profkit.cli.main import main

sys.exit(main())
