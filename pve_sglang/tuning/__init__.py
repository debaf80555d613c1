"""The tuning search (``make tune``): its space of server settings (``space``), the guided
strategy that picks each try from the server's figures (``strategy``) and the record of the
tries (``tries``)."""
