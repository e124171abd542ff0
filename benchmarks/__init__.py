"""Side-by-side benchmarks of niels_gpt (``nox -s bench``); not part of any stage."""
