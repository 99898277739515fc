"""What a person reads: the terminal tables, the charts, the HTML report, the results files, Perfetto timelines."""
