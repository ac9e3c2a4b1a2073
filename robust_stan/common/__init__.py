"""Helpers every layer may use: errors and input checks, package resources, progress bars, worker pools."""
