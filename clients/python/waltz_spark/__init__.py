"""A PySpark data source named `waltz` and the feed ingestion job."""
