"""The settings: pydantic models of every host and container setting and their validation
(``settings``), the gateway's settings (``gateway``), the monitoring's
(``monitoring``), and the settings table of the docs
generated from the defaults (``settings_table``)."""
