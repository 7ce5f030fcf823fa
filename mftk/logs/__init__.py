"""Training logs: the MF step line (`format`), readers (`parse`), summary, anomalies, exports, plots."""
