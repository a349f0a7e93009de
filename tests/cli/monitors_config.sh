# Sourced by the monitor tests: write_monitors_config SRC DST ROOT writes
# config SRC plus DeepSpeed's tensorboard and csv_monitor sections (job
# "run", under ROOT/tb and ROOT/csv) as DST; further sections may follow as
# JSON text in $4 (", \"key\": {...}").
write_monitors_config() {
  sed '$ s/}[[:space:]]*$//' "$1" > "$2"
  cat >> "$2" <<JSON
  , "tensorboard": {"enabled": true, "output_path": "$3/tb", "job_name": "run"}
  , "csv_monitor": {"enabled": true, "output_path": "$3/csv", "job_name": "run"}
  ${4:-}
}
JSON
}
