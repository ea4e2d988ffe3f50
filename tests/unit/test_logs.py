"""``docoutbox_app.logs``: quieting urllib3's per-request warning for ``--cosmos-insecure``
(without urllib3 installed: ``tests/integration/test_cli_without_cosmos.py``)."""

from __future__ import annotations

import warnings

from urllib3.exceptions import InsecureRequestWarning

from docoutbox_app import logs


def test_unverified_tls_warnings_are_quieted_when_urllib3_is_there() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logs.quiet_unverified_tls()
        warnings.warn("unverified", InsecureRequestWarning, stacklevel=1)  # not raised
