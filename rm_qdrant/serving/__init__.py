"""Serving a pair: DualIndex (dual.py; its search in pair_search.py, its point operations in
pair_points.py, per-call options in search_options.py), AsyncDualIndex, the search demand that
``rmq migrate --order demand`` ranks by (demand.py), and what ``rmq status`` reports
(status.py). Imports pair/ and below."""
