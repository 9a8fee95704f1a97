"""What every step runs on: its arguments, context, report and failure lines, the Spark session,
object storage and notices. Imports no other part of spark_jobs."""
