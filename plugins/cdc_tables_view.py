"""The CDC tables view ships in the package (`cdc_airflow.view.plugin`): nothing to copy here.

Airflow loads it through the package's `airflow.plugins` entry point wherever the package is
installed (a wheel, or `make install`'s editable install). This file defines no plugin on
purpose: the same plugin from a plugins folder too is registered once and reported as an
import error ("already registered") the second time.
"""
