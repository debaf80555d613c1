"""The tuning search (``make tune``): its space of server settings (``space``), the guided
strategy that picks each try from the server's figures (``strategy``), the plan ``--dry``
shows (``plan``), the tuned file the deploy reads (``tuned_file``), the record of every try
(``record``), its table and plot (``report``), and the driver that runs one container's
search against its server (``drive``)."""
