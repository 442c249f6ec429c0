"""Tests of The benchmark scripts and their documents: smokes, figures and the map."""
