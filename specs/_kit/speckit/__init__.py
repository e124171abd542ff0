"""The maintainers' spec kit: spec-side helpers several stages share, as one package.

Modules (each imported on its own; this file imports nothing, so a driver
that needs the torch-only sweeps brings no test library and no stage in):

- ``acceptance``: the acceptance tests' and runtime drivers' builders (config
  strategy, model and tokens), the float64 sampling filter, the recorder of
  attention calls and the recording that leaves RoPE's inside out;
- ``sweeps``: the oracle drivers' general sweeps (torch only at run time);
- ``module_sweeps``: a ``(B, T, C)`` module's whole domain sweep, a table
  (``ModuleSweep``) a stage fills in; it imports ``sweeps``;
- ``module_calls``: ``Sized``, ``o.call`` with the sizing keywords a group of
  a driver's calls shares;
- ``module_runtime``: a module driven through every mode for the runtime
  rules' probe;
- ``model_sweeps``: a whole model's domain sweep, the ``ModelSweep`` table the
  model stages fill in; it imports ``sweeps``;
- ``sizes``: the ``size`` axis, a real model's sizes (GPT-2 small's) and one
  wide draw from the secret seed for each shape-polymorphic call (the
  standard library only).

How spec-side code is imported (decided here, once). Nothing under
``specs/`` is loaded by path. Every run of spec-side code puts folders on
``sys.path`` from the tree it judges with (the base's, in a verdict;
``niels_gpt_contracts.specpath``):

- ``specs/_kit``, so that ``from speckit import sweeps`` finds this package;
- for a driver run (the oracle worker, the runtime-rule probe), the folder
  ``specs/<stage>/`` of each stage it drives, so that a driver imports its own
  stage's helpers by their plain names (``import rope_oracle_domain``);
- for an acceptance-test run (the checker's pytest plugin, in the nox
  sessions and in a verdict's sandbox alike), every ``specs/<stage>/tests``
  folder, so that a test imports its stage's shared builders
  (``import kv_cache_kit as kit``).

Those folders share one namespace, so every module in them is named after its
stage (``<stage>_...``): the name says whose it is, and two stages never
collide. The stage folders are not packages: a stage's spec-side files are
judged as that stage's evidence by their path, not by a package name.

A spec declares the kit modules its files import (``[oracle] kit``); the
checker derives a kit file's users from those declarations and refuses an
import a spec does not declare (``checks.context.speckit`` in the checker).
"""
