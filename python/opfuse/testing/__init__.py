"""Test support that ships with the package: the PTX emulator (emulator/)."""
