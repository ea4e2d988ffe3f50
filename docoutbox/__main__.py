"""``python -m docoutbox``: the same as the ``docoutbox`` command."""

import sys

from docoutbox.cli import main

sys.exit(main())
