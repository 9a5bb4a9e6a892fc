"""Harness adapters: one YAML spec per harness (adapters/) and the files and environment rendered from it."""
