"""What an amendment changes: the base and head specs compared, the evidence
files compared definition by definition, whether a moved package's
``__init__.py`` only re-exports, and the stage's changelog.
"""
