"""Tests of The tools in tools/: the import graph, the layers, the walks, the map of where things are."""
