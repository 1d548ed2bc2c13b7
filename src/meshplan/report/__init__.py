"""Reports: terminal tables (text.py), matplotlib figures (plots.py), the self-contained HTML report (html.py),
the ``report`` / ``sweep`` commands (commands.py) and a headless-Chromium driver for checking pages (browser.py)."""
