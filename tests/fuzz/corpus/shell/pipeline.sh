echo "$EVENT_TYPE" >> logs/events.txt && adf fs_write '{"path":"a","content":"b"}'
