"""Tests of condsearch.serve: the HTTP server, its lanes, builds, limits and page."""
