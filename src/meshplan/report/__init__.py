"""Reports: text tables (text.py); plots and HTML come later in the data flow."""
