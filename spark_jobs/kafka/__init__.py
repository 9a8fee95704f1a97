"""A Kafka table's source: the broker's offsets, the bounded read, the exactly-once stage."""
