"""SGLang's model gateway (``smg``) in front of the serving containers: which servers it fronts
and at which URLs (``workers``), its command line, unit, env file and worker list
(``render``), the order of a roll of its replicas and its words (``roll``). Pure: the gateway phase (``tasks/gateway.py``) writes and runs them."""
