"""The head atlas (issue 55): tidy per-head tables as Parquet (:mod:`posgen.atlas.tables`) and one offline
interactive page per run built from them (:mod:`posgen.atlas.page`)."""
