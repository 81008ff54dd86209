"""`python -m demo` runs the demo (`demo.loop`)."""

import sys

from demo.loop import main

sys.exit(main())
