"""understudy's version: the one place it is written (CMakeLists.txt and the
package metadata read it from here)."""
__version__ = "0.1.0"
