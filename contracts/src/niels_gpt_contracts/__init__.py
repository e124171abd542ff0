"""The niels_gpt spec gate and the pytest plugin that gives tests their device."""
