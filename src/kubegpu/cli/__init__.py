"""The `kubegpu` command line: the root group whose subcommands are imported on first use (`main`), the
click types and flag options built from the settings tables (`params`) and logging set-up (`logs`).

May import `settings` and `common`. Each subcommand lives with the package it drives.
"""
