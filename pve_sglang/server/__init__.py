"""The SGLang server: its command line, unit and env file (``command``), what its startup log
means (``startup_log``), the benchmark's command and results (``bench``) and their history
(``bench_history``)."""
