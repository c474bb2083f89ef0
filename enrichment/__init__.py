"""What Tally derives from an accepted event before storing it: visitor id, country,
browser/OS/device, pathname, referrer host, UTM parameters and click ids."""
