"""A multi-domain labelled text set built from registry packages (issue 39): see README.md here."""
