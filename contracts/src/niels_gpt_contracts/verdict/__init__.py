"""The gate's verdicts: ``contracts check`` (``static_verdict``) and the one
trusted verdict on a stage's pull request, ``contracts pr`` (``pr``).

Layers (import-linter): ``cli`` > ``reporters`` > ``verdict`` > ``mutants`` >
``sandbox | checks``. ``verdict`` decides and returns data; it never imports
the PR's code and never renders (the ``cli`` prints its rows with ``reporters``).
``static_verdict`` runs the checks in order for ``contracts check`` (and its
helpers serve ``pr``'s static step); ``plan`` says what runs, ``ratchet``
judges test outcomes against the base, ``runtime`` judges what the
runtime-rule drivers dispatched, ``integrity`` proves the checker and the
sandbox were not rewritten while the PR's code ran, and ``pr`` puts the steps
in order and builds the ``Result``; ``state`` holds what ``pr`` was asked and
what its phases share.
"""
