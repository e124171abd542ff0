"""``contracts pr``: the one trusted verdict on a stage's pull request.

Layers (import-linter): ``cli`` > ``reporters | verdict`` > ``mutants`` >
``sandbox | checks``. ``verdict`` decides and returns data; it never imports
the PR's code and never renders (the ``cli`` prints its rows with ``reporters``).
``plan`` says what runs, ``ratchet`` judges test outcomes against the base,
``runtime`` judges what the runtime-rule drivers dispatched, ``integrity``
proves the checker and the sandbox were not rewritten while the PR's code ran,
and ``pr`` puts the steps in order and builds the ``Result``; ``state`` holds
what ``pr`` was asked and what its phases share.
"""
