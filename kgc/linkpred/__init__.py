"""Link prediction: model (query + tail towers), SimKGC loss, training, evaluation, index, predict."""
