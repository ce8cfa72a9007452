# ZooKeeper for the container test only (tests/deploy/test_containers.py): Debian's package on the local base.
# Its data goes under /data, not /var/lib/zookeeper (whose myid points at a comment-only file).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends zookeeper \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["java", "-cp", "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar", \
            "org.apache.zookeeper.server.ZooKeeperServerMain"]
CMD ["/conf/zoo.cfg"]
