"""Tests of condsearch.cli: the commands, their options, their one-line errors."""
