"""``python -m docoutbox_app``: the same as the ``docoutbox`` command."""

import sys

from docoutbox_app.cli import main

sys.exit(main())
