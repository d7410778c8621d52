# parasol compare: best predicted iteration time against search time.
$a0 << EOD
0.008180 446.649429
4.765777 446.649429

EOD
$a1 << EOD
0.001229 446.649429
0.106837 444.43556
0.133220 441.091266
0.749576 438.630663
0.877415 438.322473
0.884233 438.123779
1.050522 437.819897
1.056752 437.615347
1.225201 437.311644
1.227048 437.110123
2.143026 432.946184
2.166629 431.735199
2.190024 431.102365
4.446177 428.296807
4.834578 428.296807

EOD
$a2 << EOD
0.001786 446.649429
0.095441 444.43556
0.123447 441.091266
0.506273 438.630663
0.678645 438.322473
0.680950 438.123779
1.012484 437.819897
1.019366 437.615347
1.273584 437.311644
1.275883 437.110123
2.203981 432.946184
2.232961 431.735199
2.259192 431.102365
4.835853 431.102365

EOD
$a3 << EOD
0.001304 446.649429
0.152346 434.121765
4.756379 434.121765

EOD
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
  set terminal pngcairo size 960,600 font ',11'
} else {
  set terminal png size 960,600
}
set output 'compare-nmt.png'
set title 'nmt on flexflow-p100' noenhanced
set xlabel 'search time (s)'
set ylabel 'best predicted iteration time (ms)'
set key outside right top noenhanced
set grid
plot $a0 using 1:2 with steps linewidth 2 linecolor 1 title 'mcmc', \
     $a1 using 1:2 with steps linewidth 2 linecolor 2 title 'optcnn', \
     $a2 using 1:2 with steps linewidth 2 linecolor 3 title 'dp', \
     $a3 using 1:2 with steps linewidth 2 linecolor 4 title 'beam', \
     446.649429 with lines dashtype 2 linecolor 'gray' title 'data parallel'
