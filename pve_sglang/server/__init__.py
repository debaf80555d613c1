"""The SGLang server: its command line and the flags a release accepts (``command``), its unit
and env file as text (``unit_text``), both rendered once per container for the preflight and
the container phase (``render``), where it is reached (``addresses``), each flag's spelling per
sglang release (``spelling``), what to do with the unit after a change (``unit_action``), what
its startup log means (``startup_log``), the benchmark's command and results (``bench``), its
history (``bench_history``) and the hints drawn from it (``bench_hints``); ``make status``'s
rows and table (``status``)."""
