"""Profiles shipped with the package: ``--simulate NAME`` loads ``NAME.yaml`` from here."""
