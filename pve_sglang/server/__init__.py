"""The SGLang server: its command line, unit and env file (``command``), rendered once per
container for the preflight and the container phase (``render``), each flag's spelling per
sglang release (``spelling``), what to do with the unit after a change (``unit_action``), what
its startup log means (``startup_log``), the benchmark's command and results (``bench``) and
their history (``bench_history``)."""
