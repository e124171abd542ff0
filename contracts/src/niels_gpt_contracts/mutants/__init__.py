"""Mutant gate: the known bugs of each stage, and proof that its tests catch them.

Each ``[[mutants]]`` entry of ``specs/<stage>.toml`` is a literal patch (``find``
-> ``replace``) of one module of the real code. ``contracts mutants`` runs the
stage's tests clean, then once per mutant with the patched module laid over
the installed one, and reports every mutant as killed, survived, stale (its
``find`` no longer matches the code) or error (the run itself failed).

Modules: ``catalogue`` (read and apply mutants), ``launcher`` and ``zygote``
(pytest runs, forked from a server), ``fates`` (what a run means),
``proof`` (the key a kill is proven under), ``hints`` and ``store`` (the
test that killed a mutant before; proven kills), ``schedule`` (what runs,
cheapest first), ``runner`` (planning, ``contracts mutants``), ``report``
(text and JSON). The package sits beside ``reporters`` and above ``checks``
in the checker's layers.
"""
