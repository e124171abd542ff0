"""The public API a spec pins: objects imported in a fresh interpreter
(``_api_probe``), their signatures as data, and the ``def`` that really runs.
"""
