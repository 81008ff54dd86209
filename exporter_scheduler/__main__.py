"""`python -m exporter_scheduler`: the same as the `gpu-scorer` command."""

import sys

from exporter_scheduler.cli import main

sys.exit(main())
