"""``contracts pr``: the one trusted verdict on a stage's pull request.

Layers (import-linter): ``cli`` > ``verdict`` > ``reporters | mutants`` >
``sandbox`` > ``checks``. ``verdict`` decides; it never imports the PR's code.
``plan`` says what runs, ``ratchet`` judges test outcomes against the base,
``runtime`` judges what the runtime-rule drivers dispatched, ``integrity``
proves the checker and the sandbox were not rewritten while the PR's code ran,
and ``pr`` puts the steps in order and builds the ``Result``; ``state`` holds
what ``pr`` was asked and what its phases share.
"""
