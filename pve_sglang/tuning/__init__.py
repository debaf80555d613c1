"""The tuning search (``make tune``): its space of server settings (``space``), the guided
strategy that picks each try from the server's figures (``strategy``), the plan ``--dry``
shows (``plan``), the tuned file the deploy reads (``tuned_file``), the record of every try
(``record``), its table and plot (``report``), the driver that runs one model's search
against its server (``drive``), and the deployed server it measures, every node of a group
restarted together (``deployed``)."""
