"""The application ring: the only code that names concrete adapters.

Imports point inward: this package imports the core (``docoutbox``) and the adapters
(``docoutbox_mongo``, ``docoutbox_cosmos``, ``docoutbox_rabbitmq``, ``docoutbox_kafka``,
``docoutbox_spark``); nothing imports it.

- :mod:`docoutbox_app.cli`: the ``docoutbox`` command and its operator commands.
"""
