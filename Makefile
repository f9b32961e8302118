# Two entry points for a fresh machine: `make demo` and `make test`.
# Everything they need (venv, packages, a Java runtime) is installed here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup demo test test-all test-fast lint java jars browser class-archive clean

setup: $(STAMP) java jars browser class-archive

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,service,spark,bench,delta,kafka,flights]'
	touch $(STAMP)

# Spark needs a JVM, and `make jars` compiles lowtide's file system (jars/fs): use the JDK
# found, else install Debian's headless JDK.
java:
	@command -v javac >/dev/null 2>&1 || { \
	  echo "no javac found: installing openjdk-17-jdk-headless"; \
	  apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless; }

# JVM parts from Maven Central, pinned in jars/*/pom.xml (see docs/spark.md): Spark's Kafka
# connector and Delta Lake for spark.jars (minus what pyspark already ships), and a Kafka
# broker in its own folder. Fetched once here; nothing downloads at run time.
SPARK_JARS_PROVIDED := org.scala-lang,org.apache.hadoop,com.fasterxml.jackson.core,com.fasterxml.jackson.datatype,org.apache.logging.log4j,org.apache.parquet,org.slf4j,org.xerial.snappy,com.github.luben,at.yawk.lz4,org.roaringbitmap,io.airlift,commons-pool,javax.annotation,com.google.code.findbugs,org.locationtech.jts
MVN_COPY := mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime

FS_JAR := jars/spark/lib/lowtide-fs.jar
CLASS_ARCHIVE := jars/spark/lib/lowtide-classes.jsa

jars: jars/spark/lib/.fetched $(FS_JAR) jars/kafka/lib/.fetched

jars/spark/lib/.fetched: jars/spark/pom.xml
	@command -v mvn >/dev/null 2>&1 || { echo "mvn not found: apt-get install maven"; exit 1; }
	rm -rf jars/spark/lib
	$(MVN_COPY) -f jars/spark/pom.xml -DexcludeGroupIds=$(SPARK_JARS_PROVIDED) -DexcludeArtifactIds=spark-tags_2.13
	touch $@

# lowtide's Hadoop local file system without chmod processes (docs/spark.md), compiled
# against the Hadoop API pyspark ships, into the folder SessionConfig loads jars from.
$(FS_JAR): jars/spark/lib/.fetched jars/fs/pom.xml $(wildcard jars/fs/src/main/java/dev/lowtide/hadoop/*.java)
	@command -v mvn >/dev/null 2>&1 || { echo "mvn not found: apt-get install maven"; exit 1; }
	mvn -q -B -f jars/fs/pom.xml package -DskipTests
	cp jars/fs/target/lowtide-fs.jar $@

jars/kafka/lib/.fetched: jars/kafka/pom.xml
	@command -v mvn >/dev/null 2>&1 || { echo "mvn not found: apt-get install maven"; exit 1; }
	rm -rf jars/kafka/lib
	$(MVN_COPY) -f jars/kafka/pom.xml
	touch $@

# The driver JVM's class archive (docs/spark.md, "Start-up"): a short run of the demo's
# queries writes the classes it loaded; every later session maps them and starts about
# 2.5 s sooner. Written again when pyspark or the jars change (a stale one is skipped).
class-archive: $(CLASS_ARCHIVE)

$(CLASS_ARCHIVE): $(STAMP) jars/spark/lib/.fetched $(FS_JAR)
	$(BIN)/lowtide spark class-archive

# The web view's test drives a real headless browser: Debian's chromium.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "no chromium found: installing Debian's chromium"; \
	  apt-get update -qq && apt-get install -y -qq chromium; }

demo: setup
	$(BIN)/lowtide demo

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The suite CI runs: everything but the few slowest Spark tests (marked slow), so it
# stays well under 20 minutes on 2 cores; test-all adds them.
test: setup lint
	$(BIN)/python -m pytest -q -m "not slow" --durations=20

test-all: setup lint
	$(BIN)/python -m pytest -q

# For contributors, between edits: lint and the tests without Spark, minus the benches'
# and the command line's (processes, a wheel build); about 1.5 minutes on 2 cores.
test-fast: lint
	$(BIN)/python -m pytest -q -m "not spark" --ignore=tests/bench --ignore=tests/cli

clean:
	rm -rf $(VENV) build *.egg-info jars/*/lib jars/fs/target
