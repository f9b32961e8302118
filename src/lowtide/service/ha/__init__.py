"""A standby tracker (rule 18): the leader's step log in a Kafka topic, written by a
transactional producer; a standby follows it and takes over, fencing the old leader."""
